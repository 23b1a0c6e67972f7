//! The `sim_request` target: see `harness::sim_request`.
#![no_main]

#[allow(
    dead_code,
    reason = "the harness holds every target; this one uses one function"
)]
#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(init: harness::init("sim_request"), |data: &[u8]| harness::sim_request(data));
