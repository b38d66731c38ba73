//! A fresh PostgreSQL database for a benchmark.

/// Creates `corbel_bench_<random>` on the server and returns its URL.
pub async fn fresh_postgres_database(server: &str) -> String {
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
    url.to_string()
}
