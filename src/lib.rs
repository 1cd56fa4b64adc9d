//! aralez: a reverse proxy reading Aralez's config files.
#![forbid(unsafe_code)]
pub mod config;
pub mod upstream;
pub mod routing;
