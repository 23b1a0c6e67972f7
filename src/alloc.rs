//! The process's memory allocator: jemalloc, with one arena.
//!
//! Chosen from the monitor's profile (`cargo bench --bench monitor_pass`, 10,000 running jobs): with
//! glibc's malloc a fifth of each reconciliation pass went to freeing (`_int_free`, `malloc_consolidate`,
//! `unlink_chunk`) the pages of the metadata lists, and the long-lived cache (hundreds of thousands of
//! small strings and map nodes) sat in fragmented arenas: 81 ms of CPU per pass and 137 MiB peak RSS.
//! jemalloc took the pass to 58 ms; one arena instead of four per core took the peak from 127 to 118 MiB.
//! The monitor's state is owned by one task, and every thread has its own cache of small blocks in front
//! of the arena, so the single arena is not a point of contention for a runner's handful of threads.
//!
//! Declared in the library so that the binary, its tests and its benchmarks all run on the allocator
//! that production does.

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's compile-time options: read once, before `main`, when the first allocation initialises it
/// (`MALLOC_CONF`-style, through the prefixed symbol the bundled jemalloc looks for). An operator can
/// still override them at start with `_RJEM_MALLOC_CONF`.
#[repr(transparent)]
pub struct Options(*const u8);

// SAFETY: a pointer to a static, NUL-terminated byte string that is never written.
unsafe impl Sync for Options {}

#[unsafe(export_name = "_rjem_malloc_conf")]
pub static OPTIONS: Options = Options(c"narenas:1".as_ptr().cast());

/// How many arenas jemalloc runs with (the options in force), or `None` if it does not answer.
pub fn arenas() -> Option<u32> {
    let mut narenas: u32 = 0;
    let mut len = std::mem::size_of::<u32>();
    // SAFETY: `opt.narenas` is an unsigned read-only value; the buffer is a u32 of its size.
    let rc = unsafe {
        tikv_jemalloc_sys::mallctl(
            c"opt.narenas".as_ptr(),
            (&raw mut narenas).cast(),
            &raw mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    (rc == 0).then_some(narenas)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_options_are_in_force() {
        drop(vec![0u8; 1]);
        assert_eq!(
            super::arenas(),
            Some(1),
            "jemalloc runs with the one arena configured"
        );
    }
}
