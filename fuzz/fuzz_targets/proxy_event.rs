//! The `proxy_event` target: see `harness::proxy_event`.
#![no_main]

#[allow(
    dead_code,
    reason = "the harness holds every target; this one uses one function"
)]
#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(init: harness::init("proxy_event"), |data: &[u8]| harness::proxy_event(data));
