//! The JSON documents Surge reads from users: instance descriptors (`surge mount
//! --descriptor`), stage item lists (the manager's stage API), peaks files (`surge run
//! --peaks`). The first byte picks the document; errors, never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, text)) = data.split_first() else {
        return;
    };
    match which % 3 {
        0 => {
            if let Ok(d) = serde_json::from_slice::<surge_proto::InstanceDescriptor>(text) {
                // What a mount does with one first.
                let _ = d.namespace(surge_core::NamespaceId(0));
                let _ = serde_json::to_vec(&d);
            }
        }
        1 => {
            let _ = serde_json::from_slice::<Vec<surge_stage::StageItem>>(text);
        }
        _ => {
            let _ = serde_json::from_slice::<surge_core::peaks::Peaks>(text);
        }
    }
});
