//! The `open_session` target: see `harness::open_session`.
#![no_main]

#[allow(
    dead_code,
    reason = "the harness holds every target; this one uses one function"
)]
#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(init: harness::init("open_session"), |data: &[u8]| harness::open_session(data));
