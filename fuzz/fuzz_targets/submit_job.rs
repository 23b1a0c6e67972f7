//! The `submit_job` target: see `harness::submit_job`.
#![no_main]

#[allow(
    dead_code,
    reason = "the harness holds every target; this one uses one function"
)]
#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(init: harness::init("submit_job"), |data: &[u8]| harness::submit_job(data));
