//! Generates the gRPC client and server stubs of the node service from a Rust description
//! (tonic-build's `manual` module): no .proto file and no protoc, so a fresh machine builds the
//! crate with plain `cargo build`. The messages are hand-written prost structs in `src/wire.rs`.

fn main() {
    let method = |name: &str, route: &str| {
        tonic_build::manual::Method::builder()
            .name(name)
            .route_name(route)
            .input_type("crate::wire::Frame")
            .output_type("crate::wire::Frame")
            .codec_path("tonic_prost::ProstCodec")
            .build()
    };
    let service = tonic_build::manual::Service::builder()
        .name("Node")
        .package("blindfold.node.v1")
        .comment("One ORAM node: block reads, writes, commits and growth for the oblivious load balancer.")
        .method(method("info", "Info"))
        .method(method("access", "Access"))
        .method(method("commit", "Commit"))
        .method(method("verify", "Verify"))
        .method(method("grow", "Grow"))
        .build();
    tonic_build::manual::Builder::new().compile(&[service]);
}
