#![no_main]
//! `cargo xtask fuzz layer_headers`: see `rate_tier_fuzz_bodies::layer_headers`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rate_tier_fuzz_bodies::layer_headers(data));
