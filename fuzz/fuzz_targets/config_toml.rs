//! The `config_toml` target: see `harness::config_toml`.
#![no_main]

#[allow(
    dead_code,
    reason = "the harness holds every target; this one uses one function"
)]
#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(init: harness::init("config_toml"), |data: &[u8]| harness::config_toml(data));
