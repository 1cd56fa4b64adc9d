//! Consul discovery (SPEC §13.1).
