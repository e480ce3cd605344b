//! The part of `rinad` other crates use: its configuration file's reader and
//! checker (`config`), so that the fuzz targets (`fuzz/`) and tools can feed
//! it text without starting a daemon. The daemon itself is the `rinad`
//! binary (`main.rs`).

pub mod config;
pub mod fuzzing;
