//! The Webdis shim that quotas and global buckets reach Redis through: the command encoding and reply
//! classes ([`webdis`]).

pub mod webdis;
