#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| corbel_fuzz::version(data));
