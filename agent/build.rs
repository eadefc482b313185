//! Generate the kubelet PodResources client and (for tests) server from `proto/podresources.proto`, with a pure-Rust
//! protobuf compiler (no protoc needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/podresources.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
