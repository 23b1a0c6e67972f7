//! The `traceparent` target: see `harness::traceparent`.
#![no_main]

#[allow(
    dead_code,
    reason = "the harness holds every target; this one uses one function"
)]
#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(init: harness::init("traceparent"), |data: &[u8]| harness::traceparent(data));
