//! Every integration test of this crate but those that change the whole process (see
//! Cargo.toml), built as one binary: one link instead of one per file, which is most of
//! the test command's build time. `every_test_file_is_built` keeps a new file from being
//! left out.

mod bulk_load;
mod contract;
mod crash_oblivious;
mod direct;
mod durable;
mod durable_tao;
mod grow;
mod oblivious;
mod oblivistore;
mod onion;
mod onion_oblivious;
mod real_servers;
mod rebuild;
mod ring_oblivious;
mod rotation;
mod sealed_path;
mod sealed_ring;
mod state_at_rest;
mod tao;
mod tee;

#[test]
fn every_test_file_is_built() {
    blindfold_testkit::every_test_file_is_built(env!("CARGO_MANIFEST_DIR"));
}
