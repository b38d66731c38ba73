//! A fresh PostgreSQL database for a benchmark, dropped when it is done.

/// A `corbel_bench_<random>` database on a server; dropped (its sessions
/// ended) when this goes out of scope, so runs leave nothing behind.
pub struct BenchDatabase {
    server: String,
    name: String,
    /// The database's URL.
    pub url: String,
}

/// Creates `corbel_bench_<random>` on the server.
pub async fn fresh_postgres_database(server: &str) -> BenchDatabase {
    use sea_orm::{ConnectionTrait, Database};
    let name = format!("corbel_bench_{}", uuid::Uuid::new_v4().simple());
    let admin = Database::connect(server).await.expect("PostgreSQL");
    admin
        .execute_unprepared(&format!("CREATE DATABASE \"{name}\""))
        .await
        .expect("create the bench database");
    admin.close().await.ok();
    let mut url = url::Url::parse(server).expect("postgres URL");
    url.set_path(&format!("/{name}"));
    BenchDatabase {
        server: server.to_owned(),
        name,
        url: url.to_string(),
    }
}

impl Drop for BenchDatabase {
    /// On a thread of its own, so it can be dropped within a runtime or
    /// outside one; a failure is said, not fatal.
    fn drop(&mut self) {
        let (server, name) = (self.server.clone(), self.name.clone());
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async {
                use sea_orm::{ConnectionTrait, Database};
                let admin = Database::connect(&server)
                    .await
                    .map_err(|e| e.to_string())?;
                let dropped = admin
                    .execute_unprepared(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string());
                admin.close().await.ok();
                dropped
            })
        })
        .join()
        .unwrap_or_else(|_| Err("the dropping thread panicked".into()));
        if let Err(e) = dropped {
            eprintln!("(cannot drop the bench database {}: {e})", self.name);
        }
    }
}
