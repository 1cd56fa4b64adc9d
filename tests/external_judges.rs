//! The external judges' binary: sslyze, testssl.sh, h2spec (`judges`), grpc-go's interop client
//! and server (`judges_grpc`) and slowhttptest (`judges_slow`) against the real binary. Apart
//! from the rest of the suite (`tests/suite.rs`) because they are timing-sensitive: they run one
//! at a time (`support::tools::ONE_JUDGE_AT_A_TIME`), and beside no other module's traffic.

mod support;

mod judges;
mod judges_grpc;
mod judges_slow;
