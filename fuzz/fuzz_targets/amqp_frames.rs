//! The `amqp_frames` target: see `harness::amqp_frames`.
#![no_main]

#[allow(
    dead_code,
    reason = "the harness holds every target; this one uses one function"
)]
#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(init: harness::init("amqp_frames"), |data: &[u8]| harness::amqp_frames(data));
