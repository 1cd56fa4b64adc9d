//! The process's allocator: mimalloc, called the way `malloc` is when the alignment asked for
//! is one `mi_malloc` gives anyway. The `mimalloc` crate's allocator always takes mimalloc's
//! aligned path, which costs about a hundred instructions more per allocation (callgrind, a
//! dozen allocations per proxied request). Larger alignments (tokio's task cells and I/O
//! registrations, 128 bytes) ask a plain call for a power-of-two size, which mimalloc places at
//! an address aligned to that size: its aligned path over-allocates whenever no free block
//! happens to be aligned, which for a task cell is every time (about 190 instructions more for
//! each new connection's task, callgrind).
//! It also reads what the process holds resident ([`resident_bytes`]), for the metrics and for
//! checking that freed memory goes back.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// The alignment every `mi_malloc` block of at least this size has (`MI_MAX_ALIGN_SIZE`).
const MALLOC_ALIGN: usize = 16;

/// mimalloc as the global allocator.
pub struct Mimalloc;

/// The largest power-of-two block mimalloc places at an address aligned to its own size
/// (`MI_PAGE_MAX_START_BLOCK_ALIGN2`).
const NATURAL_ALIGN_MAX: usize = 4096;

/// Whether a plain (unaligned) call gives `align` for a block of `size` bytes: blocks smaller
/// than 16 bytes are only aligned to their size class, as with the C library's `malloc`.
fn plain_call_aligns(align: usize, size: usize) -> bool {
    align <= MALLOC_ALIGN && align <= size
}

/// The power-of-two size at which a plain call gives `align` for `size` bytes, if there is
/// one. It wastes no more than the aligned path's over-allocation (`size + align - 1`), which
/// mimalloc rounds up to a size class anyway.
fn naturally_aligned_size(align: usize, size: usize) -> Option<usize> {
    let rounded = size.max(align).checked_next_power_of_two()?;
    (rounded <= NATURAL_ALIGN_MAX).then_some(rounded)
}

/// A block aligned beyond 16 bytes: a plain call at a power-of-two size when that gives the
/// alignment (checked, so a different mimalloc can only make it slower), else the aligned path.
///
/// # Safety
/// As [`GlobalAlloc::alloc`].
#[allow(unsafe_code)]
unsafe fn alloc_over_aligned(layout: Layout, zeroed: bool) -> *mut u8 {
    let align = layout.align();
    if let Some(size) = naturally_aligned_size(align, layout.size()) {
        // SAFETY: a plain allocation of a non-zero size; freed below if it will not do.
        let block = unsafe {
            if zeroed {
                mi::mi_zalloc(size)
            } else {
                mi::mi_malloc(size)
            }
        };
        // A null block passes too: the caller sees the failure.
        if (block as usize) & (align - 1) == 0 {
            return block.cast();
        }
        // SAFETY: the block just came from mimalloc and nothing else has it.
        unsafe { mi::mi_free(block) };
    }
    // SAFETY: mimalloc's aligned entry points take any power-of-two alignment.
    unsafe {
        if zeroed {
            mi::mi_zalloc_aligned(layout.size(), align).cast()
        } else {
            mi::mi_malloc_aligned(layout.size(), align).cast()
        }
    }
}

/// Lets the calling thread's mimalloc heap give memory freed a while ago back to the system.
///
/// mimalloc returns an emptied page to the system a second after it emptied (its purge
/// delay), but only when that thread next calls into it often enough to do its housekeeping.
/// A worker that goes quiet, as when its connections all park, never does, and keeps what they
/// freed resident: about 3 KiB a parked connection, more than half of what one costs (release
/// build, 10,000 connections). Cheap (a walk over the thread's pages that still hold free
/// blocks), meant to be called every few seconds; nothing when another allocator is in use.
pub fn give_back_freed_memory() {
    // SAFETY: `mi_collect` takes no pointer and touches only the calling thread's heap.
    #[allow(unsafe_code)]
    unsafe {
        mi_collect(false)
    };
}

/// This process's resident memory (`VmRSS`), in bytes; 0 if it cannot be read.
pub fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

// `libmimalloc-sys` declares `mi_collect` only with its `extended` feature (and one more crate);
// the function is in the library it links either way (`mimalloc.h`: `void mi_collect(bool)`).
#[allow(unsafe_code)]
unsafe extern "C" {
    fn mi_collect(force: bool);
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
            // SAFETY: as this function's.
            unsafe { alloc_over_aligned(layout, false) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if plain_call_aligns(layout.align(), layout.size()) {
            mi::mi_zalloc(layout.size()).cast()
        } else {
            // SAFETY: as this function's.
            unsafe { alloc_over_aligned(layout, true) }
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

    /// This binary's allocator is the system's: only this module's tests call mimalloc, and
    /// the others end within milliseconds, long before this one's freed pages are due, so
    /// nothing else runs mimalloc's housekeeping for them.
    #[test]
    #[allow(unsafe_code)]
    fn memory_freed_a_second_ago_goes_back_to_the_system_when_asked() {
        const BLOCKS: usize = 32 * 1024;
        let layout = Layout::from_size_align(4096, 8).unwrap();
        // SAFETY: each block is written within its size and freed once with its layout.
        let blocks: Vec<*mut u8> = (0..BLOCKS)
            .map(|_| unsafe {
                let p = Mimalloc.alloc(layout);
                p.write_bytes(1, 4096);
                p
            })
            .collect();
        for p in blocks {
            // SAFETY: as above.
            unsafe { Mimalloc.dealloc(p, layout) };
        }
        // mimalloc's purge delay: a freed page goes back no sooner than a second later.
        std::thread::sleep(std::time::Duration::from_millis(1200));
        let kept = resident_bytes() / 1024;
        give_back_freed_memory();
        let given_back = kept.saturating_sub(resident_bytes() / 1024);
        // 128 MiB were freed; other tests' allocations move RSS by far less meanwhile.
        assert!(
            given_back >= 64 * 1024,
            "only {given_back} KiB of 131072 freed KiB went back"
        );
    }

    #[test]
    fn an_over_aligned_block_is_asked_for_at_a_power_of_two_size_up_to_4_kib() {
        assert_eq!(naturally_aligned_size(128, 896), Some(1024));
        assert_eq!(naturally_aligned_size(128, 1024), Some(1024));
        assert_eq!(naturally_aligned_size(128, 100), Some(128));
        assert_eq!(naturally_aligned_size(64, 2100), Some(4096));
        assert_eq!(naturally_aligned_size(128, 4097), None);
        assert_eq!(naturally_aligned_size(8192, 64), None);
        assert_eq!(naturally_aligned_size(128, usize::MAX), None);
    }

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
            (896, 128),
            (1280, 128),
            (4000, 128),
            (5000, 128),
            (100, 4096),
            (64, 8192),
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
