#![no_main]
//! `cargo xtask fuzz gcra_check_all`: see `rate_tier_fuzz_bodies::gcra_check_all`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rate_tier_fuzz_bodies::gcra_check_all(data));
