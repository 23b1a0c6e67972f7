//! The `authz_request` target: see `harness::authz_request`.
#![no_main]

#[allow(
    dead_code,
    reason = "the harness holds every target; this one uses one function"
)]
#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(init: harness::init("authz_request"), |data: &[u8]| harness::authz_request(data));
