//! Page-aligned I/O buffers, allocated once before the timed loop. O_DIRECT needs the buffer
//! address (and sizes and offsets) aligned to the device's logical block; 4 KiB covers every
//! device in use, so every buffer is aligned that way whether or not `--direct` is set.

use std::alloc::{alloc_zeroed, dealloc, Layout};

/// Alignment of every buffer: the largest logical block size of common devices.
pub const ALIGN: usize = 4096;

/// A zero-initialised, [`ALIGN`]-aligned heap buffer.
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `len` bytes (at least one page, so a zero-length request is still valid).
    pub fn new(len: usize) -> Result<AlignedBuf, std::alloc::LayoutError> {
        let layout = Layout::from_size_align(len.max(ALIGN), ALIGN)?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let Some(ptr) = std::ptr::NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout);
        };
        Ok(AlignedBuf { ptr, len, layout })
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for layout.size() >= len initialised bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Fills the buffer with pseudo-random bytes so compressing or deduplicating storage cannot
    /// flatter the result (IOR and fio do the same).
    pub fn fill_pseudo_random(&mut self, seed: u64) {
        let mut x = seed | 1;
        for chunk in self.as_mut_slice().chunks_mut(8) {
            x = crate::layout::splitmix64(x);
            let bytes = x.to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in new() with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_page_aligned_and_sized() {
        for len in [0usize, 1, 4096, 8 << 20] {
            let b = AlignedBuf::new(len).unwrap();
            assert_eq!(b.as_slice().as_ptr() as usize % ALIGN, 0);
            assert_eq!(b.as_slice().len(), len);
        }
    }

    #[test]
    fn pseudo_random_fill_is_not_constant() {
        let mut b = AlignedBuf::new(4096).unwrap();
        b.fill_pseudo_random(7);
        let s = b.as_slice();
        assert!(s.iter().any(|&x| x != s[0]));
    }
}
