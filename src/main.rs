//! The `corbel` binary: parse the command line and hand over to the library.

// mimalloc: the server allocates many small, short-lived objects (JSON, GraphQL
// documents, rows); mimalloc serves those markedly faster than glibc's malloc
// and returns memory more readily (see the sync and foundation benchmarks).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    corbel::cli::main()
}
