//! Giving memory back to the system after a sweep, on glibc.
//!
//! A sweep that empties a table frees its storage, but glibc keeps freed
//! memory that is not at the top of the heap, and raises its threshold for
//! mapping large blocks each time one is unmapped: the first wave of
//! buckets is mapped and returned, the next ones come from the heap and
//! stay, about half their peak, for good. `malloc_trim(0)` returns the free
//! pages of every arena. It is called from the background sweeper only
//! (never on a request), after a sweep freed at least [`TRIM_AFTER`] bytes
//! of tables. Elsewhere than glibc it does nothing: other allocators give
//! large blocks back by themselves.

/// Bytes of tables freed since the last trim that make the next one worth
/// its cost (a walk of the heap: about a millisecond for 100 MB).
pub(super) const TRIM_AFTER: usize = 1 << 20;

/// Returns the free pages of the heap to the system.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(super) fn trim() {
    // SAFETY: malloc_trim has no preconditions: it takes each arena's lock
    // itself, is safe to call from any thread at any time, and only
    // releases memory that is free.
    #[allow(unsafe_code)]
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Other allocators give large blocks back by themselves.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(super) fn trim() {}
