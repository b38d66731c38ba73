//! Replicas (issue 18): `replicas` holds each server that joined the store,
//! with its advertised address and a heartbeat lease; `cluster_leases` holds
//! named leases (the leader's, `leader`) with their holder and a fencing
//! epoch that grows with every new holder. Times are milliseconds since the
//! Unix epoch by the database's clock, so replicas on hosts whose clocks
//! disagree still agree on who holds what.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Replicas::Table)
                    .col(pk_uuid(Replicas::Id))
                    .col(string(Replicas::AdvertiseUrl))
                    .col(string(Replicas::Host))
                    .col(integer(Replicas::Pid))
                    .col(string(Replicas::Version))
                    .col(big_integer(Replicas::StartedMs))
                    .col(big_integer(Replicas::HeartbeatMs))
                    .col(big_integer(Replicas::LeaseUntilMs))
                    .col(big_integer_null(Replicas::StoppedMs))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(ClusterLeases::Table)
                    .col(string(ClusterLeases::Name).primary_key())
                    .col(uuid_null(ClusterLeases::Holder))
                    .col(big_integer(ClusterLeases::Epoch))
                    .col(big_integer(ClusterLeases::UntilMs))
                    .to_owned(),
            )
            .await?;
        manager
            .exec_stmt(
                Query::insert()
                    .into_table(ClusterLeases::Table)
                    .columns([
                        ClusterLeases::Name,
                        ClusterLeases::Epoch,
                        ClusterLeases::UntilMs,
                    ])
                    .values_panic(["leader".into(), 0i64.into(), 0i64.into()])
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(ClusterLeases::Table).to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(Replicas::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum Replicas {
    Table,
    Id,
    AdvertiseUrl,
    Host,
    Pid,
    Version,
    StartedMs,
    HeartbeatMs,
    LeaseUntilMs,
    StoppedMs,
}

#[derive(DeriveIden)]
enum ClusterLeases {
    Table,
    Name,
    Holder,
    Epoch,
    UntilMs,
}
