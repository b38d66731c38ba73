//! Compiles the provider protocol with `protox` (pure Rust, no `protoc`) and
//! generates the tonic clients and servers.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["corbel/provider/v1/provider.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["."])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
