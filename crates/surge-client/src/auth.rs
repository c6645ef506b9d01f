//! Where a command gets the capability (`surge_auth::Token`) its connections present to the
//! servers (docs/SECURITY.md):
//!
//! - from the manager ([`from_manager`]), which checks with MUNGE who is asking and whether they
//!   may use the instance: what users, `surge run` and jobs do;
//! - made with the cluster key ([`admin`], [`for_instance`]) by whoever can read it (root and the
//!   service user): what administrators' commands by hand and the manager itself do.

use anyhow::Context;
use std::path::{Path, PathBuf};
use surge_auth::{Caller, Claims, Key, Rights, Token};
use surge_proto::InstanceDescriptor;

/// How long a capability made with the key lasts.
pub const KEY_TOKEN_SECS: i64 = 30 * 24 * 3600;

/// The key file: `path`, else `$SURGE_KEY_FILE`, else the default.
pub fn key_file(path: Option<&Path>) -> PathBuf {
    path.map(Path::to_path_buf)
        .unwrap_or_else(Key::default_path)
}

fn load(path: Option<&Path>) -> anyhow::Result<Key> {
    let p = key_file(path);
    Key::load(&p).with_context(|| {
        "without the cluster key, ask the manager for access instead (--manager HOST:PORT or \
         SURGE_MANAGER)"
            .to_string()
    })
}

/// An administrator's capability (every instance, server administration), made with the key.
pub fn admin(key: Option<&Path>) -> anyhow::Result<Token> {
    Ok(Token::admin(&load(key)?, Caller::me(), KEY_TOKEN_SECS))
}

/// A capability for `instance` (namespace `ns`, or all), acting for this process's user, made
/// with the key.
pub fn for_instance(key: Option<&Path>, instance: u64, ns: Option<u32>) -> anyhow::Result<Token> {
    Ok(Token::mint(
        &load(key)?,
        &Claims {
            instance,
            ns,
            caller: Caller::me(),
            rights: Rights::Instance,
            expires: surge_auth::token::now() + KEY_TOKEN_SECS,
            // Made by hand with the key: bound to no generation of the instance.
            generation: 0,
        },
    ))
}

/// A capability for instance `instance` (or the persistent instance `persistent`), namespace
/// `ns` (or all of them), and its descriptor, from the manager at `manager`.
pub async fn from_manager(
    manager: &str,
    instance: u64,
    persistent: &str,
    ns: Option<u32>,
) -> anyhow::Result<(InstanceDescriptor, Token)> {
    let mut c = surge_api::connect(manager).await?;
    let cap = c
        .get_capability(surge_api::v1::GetCapabilityRequest {
            instance,
            persistent_name: persistent.to_string(),
            namespace: ns.unwrap_or(0),
            all_namespaces: ns.is_none(),
        })
        .await
        .map_err(|s| anyhow::anyhow!("{}", s.message()))?
        .into_inner();
    let desc: InstanceDescriptor = serde_json::from_str(&cap.descriptor_json)
        .context("the manager's instance descriptor is not valid")?;
    let token = Token::from_text(&cap.token)?;
    Ok((desc, token))
}
