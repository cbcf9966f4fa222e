//! Every integration test of this crate but those that change the whole process (see
//! Cargo.toml), built as one binary: one link instead of one per file, which is most of
//! the test command's build time. `every_test_file_is_built` keeps a new file from being
//! left out.

mod backends;
mod conformance;
mod lease;
mod real_servers;
mod remote_fuzz;
mod s3_redis_urls;
mod select;
mod tee;
mod wrappers;
mod xor;

#[test]
fn every_test_file_is_built() {
    blindfold_testkit::every_test_file_is_built(env!("CARGO_MANIFEST_DIR"));
}
