//! The `amqp_delivery` target: see `harness::amqp_delivery`.
#![no_main]

#[allow(
    dead_code,
    reason = "the harness holds every target; this one uses one function"
)]
#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(init: harness::init("amqp_delivery"), |data: &[u8]| harness::amqp_delivery(data));
