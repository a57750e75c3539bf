#![no_main]
//! `cargo xtask fuzz plans_toml`: see `rate_tier_fuzz_bodies::plans_toml`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rate_tier_fuzz_bodies::plans_toml(data));
