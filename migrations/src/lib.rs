//! The schema, as an ordered list of migrations. `corbel serve` applies them at
//! boot; `corbel migrate` applies them and exits. A migration, once released, is
//! never edited: change the schema with a new one.

pub use sea_orm_migration::prelude::*;

mod m20261130_000001_users_and_tokens;
mod m20261130_000002_repositories;
mod m20261130_000003_providers;
mod m20261130_000004_deployments;
mod m20261201_000005_deployment_operations;
mod m20261201_000006_provider_path;
mod m20261201_000007_invalid_elements;
pub mod m20261201_000008_projects;
mod m20261201_000009_audit_and_quantities;
mod m20261202_000010_plans_and_revisions;
mod m20261203_000011_replicas;
pub mod m20261206_000012_state_texts;
mod m20261206_000013_resource_health;
mod m20261206_000014_replica_identity;
mod m20261206_000015_provider_run_as;
mod m20261207_000016_deployments_by_time;

pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m20261130_000001_users_and_tokens::Migration),
            Box::new(m20261130_000002_repositories::Migration),
            Box::new(m20261130_000003_providers::Migration),
            Box::new(m20261130_000004_deployments::Migration),
            Box::new(m20261201_000005_deployment_operations::Migration),
            Box::new(m20261201_000006_provider_path::Migration),
            Box::new(m20261201_000007_invalid_elements::Migration),
            Box::new(m20261201_000008_projects::Migration),
            Box::new(m20261201_000009_audit_and_quantities::Migration),
            Box::new(m20261202_000010_plans_and_revisions::Migration),
            Box::new(m20261203_000011_replicas::Migration),
            Box::new(m20261206_000012_state_texts::Migration),
            Box::new(m20261206_000013_resource_health::Migration),
            Box::new(m20261206_000014_replica_identity::Migration),
            Box::new(m20261206_000015_provider_run_as::Migration),
            Box::new(m20261207_000016_deployments_by_time::Migration),
        ]
    }
}
