//! Every integration test of this crate but those that change the whole process (see
//! Cargo.toml), built as one binary: one link instead of one per file, which is most of
//! the test command's build time. `every_test_file_is_built` keeps a new file from being
//! left out.

mod acl;
mod cancel;
mod common;
mod crash_oblivious;
mod directory;
mod engine;
mod frontends_fuzz;
mod grow;
mod http;
mod lifecycle;
mod listen;
mod object_lock;
mod objects;
mod recover;
mod rotation;
mod s3_api;
mod s3_fuzz;
mod sharing;
mod snapshot_damage;
mod sse;
mod stop;
mod store_durability;
mod swift;
mod tagging;
mod tls;
mod verify_names;
mod versioning;

#[test]
fn every_test_file_is_built() {
    blindfold_testkit::every_test_file_is_built(env!("CARGO_MANIFEST_DIR"));
}
