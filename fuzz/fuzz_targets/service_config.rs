#![no_main]
//! `cargo xtask fuzz service_config`: see `rate_tier_fuzz_bodies::service_config`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rate_tier_fuzz_bodies::service_config(data));
