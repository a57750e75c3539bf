#![no_main]
//! `cargo xtask fuzz rls_request`: see `rate_tier_fuzz_bodies::rls_request`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rate_tier_fuzz_bodies::rls_request(data));
