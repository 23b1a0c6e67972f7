//! The `control_message` target: see `harness::control_message`.
#![no_main]

#[allow(
    dead_code,
    reason = "the harness holds every target; this one uses one function"
)]
#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(init: harness::init("control_message"), |data: &[u8]| harness::control_message(data));
