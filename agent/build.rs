//! Generate the kubelet clients and (for tests) servers from `proto/`: the PodResources API
//! (`podresources.proto`) and the device plugin API (`deviceplugin.proto`), with a pure-Rust protobuf compiler (no
//! protoc needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/podresources.proto", "proto/deviceplugin.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
