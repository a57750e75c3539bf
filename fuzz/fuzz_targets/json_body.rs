#![no_main]
//! `cargo xtask fuzz json_body`: see `rate_tier_fuzz_bodies::json_body`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rate_tier_fuzz_bodies::json_body(data));
