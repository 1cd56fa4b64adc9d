//! The process's allocator: mimalloc, called the way `malloc` is when the alignment asked for
//! is one `mi_malloc` gives anyway. The `mimalloc` crate's allocator always takes mimalloc's
//! aligned path, which costs about a hundred instructions more per allocation (callgrind, a
//! dozen allocations per proxied request); larger alignments (tokio's task cells) still take it.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// The alignment every `mi_malloc` block of at least this size has (`MI_MAX_ALIGN_SIZE`).
const MALLOC_ALIGN: usize = 16;

/// mimalloc as the global allocator.
pub struct Mimalloc;

/// Whether a plain (unaligned) call gives `align` for a block of `size` bytes: blocks smaller
/// than 16 bytes are only aligned to their size class, as with the C library's `malloc`.
fn plain_call_aligns(align: usize, size: usize) -> bool {
    align <= MALLOC_ALIGN && align <= size
}

// The crate's only allocator code: `unsafe` is what `GlobalAlloc` is.
#[allow(unsafe_code)]
// SAFETY: every block comes from mimalloc with at least the layout's size and alignment, and
// goes back to it through `mi_free`/`mi_realloc*`, which take any mimalloc block.
unsafe impl GlobalAlloc for Mimalloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if plain_call_aligns(layout.align(), layout.size()) {
            mi::mi_malloc(layout.size()).cast()
        } else {
            mi::mi_malloc_aligned(layout.size(), layout.align()).cast()
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if plain_call_aligns(layout.align(), layout.size()) {
            mi::mi_zalloc(layout.size()).cast()
        } else {
            mi::mi_zalloc_aligned(layout.size(), layout.align()).cast()
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        mi::mi_free(ptr.cast::<c_void>());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if plain_call_aligns(layout.align(), new_size) {
            mi::mi_realloc(ptr.cast::<c_void>(), new_size).cast()
        } else {
            mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(unsafe_code)]
    fn blocks_have_the_alignment_asked_for_through_realloc() {
        let a = Mimalloc;
        for (size, align) in [
            (1, 1),
            (8, 8),
            (12, 4),
            (24, 8),
            (100, 16),
            (64, 64),
            (300, 128),
        ] {
            let layout = Layout::from_size_align(size, align).unwrap();
            // SAFETY: non-zero sizes; each block is freed once with its own layout.
            unsafe {
                let p = a.alloc(layout);
                assert!(!p.is_null() && p as usize % align == 0, "{size}/{align}");
                p.write_bytes(0xAB, size);
                let grown = a.realloc(p, layout, size * 40);
                assert!(grown as usize % align == 0, "{size}/{align} grown");
                assert_eq!(*grown.add(size - 1), 0xAB);
                let grown_layout = Layout::from_size_align(size * 40, align).unwrap();
                a.dealloc(grown, grown_layout);
                let z = a.alloc_zeroed(layout);
                assert!(z as usize % align == 0 && *z.add(size - 1) == 0);
                a.dealloc(z, layout);
            }
        }
    }
}
