//! The `sim_patch` target: see `harness::sim_patch`.
#![no_main]

#[allow(
    dead_code,
    reason = "the harness holds every target; this one uses one function"
)]
#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(init: harness::init("sim_patch"), |data: &[u8]| harness::sim_patch(data));
