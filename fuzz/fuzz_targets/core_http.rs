#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ledger_relay_wire::fuzzing::core_http(data));
