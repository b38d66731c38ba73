//! Queries on users and tokens, for the `auth` area.

use chrono::{DateTime, Utc};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait,
    IntoActiveModel, PaginatorTrait, QueryFilter, QueryOrder, Set, TransactionTrait,
};
use uuid::Uuid;

use super::entities::{api_token, user};

pub use api_token::Model as TokenRow;
pub use user::Model as UserRow;

/// A token row to insert; `token_hash` is the only form of the secret we keep.
pub struct NewToken<'a> {
    pub user_id: Uuid,
    pub kind: &'a str,
    pub name: &'a str,
    pub token_hash: String,
    pub expires_at: Option<DateTime<Utc>>,
}

pub async fn count_users(db: &DatabaseConnection) -> Result<u64, DbErr> {
    user::Entity::find().count(db).await
}

pub async fn find_by_username(
    db: &DatabaseConnection,
    username: &str,
) -> Result<Option<UserRow>, DbErr> {
    user::Entity::find()
        .filter(user::Column::Username.eq(username))
        .one(db)
        .await
}

pub async fn find_user(db: &DatabaseConnection, id: Uuid) -> Result<Option<UserRow>, DbErr> {
    user::Entity::find_by_id(id).one(db).await
}

/// Creates a user and, when given, its first token, in one transaction: a crash
/// leaves both or neither.
pub async fn insert_user_with_token(
    db: &DatabaseConnection,
    username: &str,
    role: &str,
    token: Option<(&str, &str, String)>,
) -> Result<UserRow, DbErr> {
    let txn = db.begin().await?;
    let now = Utc::now();
    let row = user::ActiveModel {
        id: Set(Uuid::new_v4()),
        username: Set(username.to_owned()),
        password_hash: Set(None),
        role: Set(role.to_owned()),
        disabled: Set(false),
        created_at: Set(now),
        updated_at: Set(now),
    }
    .insert(&txn)
    .await?;
    if let Some((kind, name, token_hash)) = token {
        insert_token(
            &txn,
            NewToken {
                user_id: row.id,
                kind,
                name,
                token_hash,
                expires_at: None,
            },
        )
        .await?;
    }
    txn.commit().await?;
    Ok(row)
}

pub async fn set_password_hash(
    db: &DatabaseConnection,
    user_id: Uuid,
    hash: String,
) -> Result<(), DbErr> {
    user::ActiveModel {
        id: Set(user_id),
        password_hash: Set(Some(hash)),
        updated_at: Set(Utc::now()),
        ..Default::default()
    }
    .update(db)
    .await
    .map(drop)
}

pub async fn insert_token(db: &impl ConnectionTrait, new: NewToken<'_>) -> Result<TokenRow, DbErr> {
    api_token::ActiveModel {
        id: Set(Uuid::new_v4()),
        user_id: Set(new.user_id),
        kind: Set(new.kind.to_owned()),
        name: Set(new.name.to_owned()),
        token_hash: Set(new.token_hash),
        created_at: Set(Utc::now()),
        expires_at: Set(new.expires_at),
        last_used_at: Set(None),
    }
    .insert(db)
    .await
}

/// Inserts the token in place of the user's tokens of the same kind and name,
/// in one transaction; returns how many it replaced.
pub async fn replace_named_token(db: &DatabaseConnection, new: NewToken<'_>) -> Result<u64, DbErr> {
    let txn = db.begin().await?;
    let replaced = api_token::Entity::delete_many()
        .filter(api_token::Column::UserId.eq(new.user_id))
        .filter(api_token::Column::Kind.eq(new.kind))
        .filter(api_token::Column::Name.eq(new.name))
        .exec(&txn)
        .await?
        .rows_affected;
    insert_token(&txn, new).await?;
    txn.commit().await?;
    Ok(replaced)
}

pub async fn token_exists(db: &DatabaseConnection, token_hash: &str) -> Result<bool, DbErr> {
    Ok(api_token::Entity::find()
        .filter(api_token::Column::TokenHash.eq(token_hash))
        .count(db)
        .await?
        > 0)
}

/// The token with this hash and the user it belongs to.
pub async fn find_token(
    db: &DatabaseConnection,
    token_hash: &str,
) -> Result<Option<(TokenRow, UserRow)>, DbErr> {
    let found = api_token::Entity::find()
        .filter(api_token::Column::TokenHash.eq(token_hash))
        .find_also_related(user::Entity)
        .one(db)
        .await?;
    Ok(found.and_then(|(token, user)| user.map(|user| (token, user))))
}

pub async fn touch_token(
    db: &DatabaseConnection,
    token_id: Uuid,
    at: DateTime<Utc>,
) -> Result<(), DbErr> {
    api_token::Entity::update_many()
        .col_expr(
            api_token::Column::LastUsedAt,
            sea_orm::sea_query::Expr::value(at),
        )
        .filter(api_token::Column::Id.eq(token_id))
        .exec(db)
        .await
        .map(drop)
}

pub async fn list_tokens(db: &DatabaseConnection, user_id: Uuid) -> Result<Vec<TokenRow>, DbErr> {
    api_token::Entity::find()
        .filter(api_token::Column::UserId.eq(user_id))
        .order_by_asc(api_token::Column::CreatedAt)
        .all(db)
        .await
}

/// Deletes a token of this user; false when there was none.
pub async fn delete_token(
    db: &DatabaseConnection,
    user_id: Uuid,
    token_id: Uuid,
) -> Result<bool, DbErr> {
    let result = api_token::Entity::delete_many()
        .filter(api_token::Column::Id.eq(token_id))
        .filter(api_token::Column::UserId.eq(user_id))
        .exec(db)
        .await?;
    Ok(result.rows_affected > 0)
}

/// Removes session tokens whose time has passed.
pub async fn delete_expired_tokens(
    db: &DatabaseConnection,
    now: DateTime<Utc>,
) -> Result<u64, DbErr> {
    let result = api_token::Entity::delete_many()
        .filter(api_token::Column::ExpiresAt.lt(now))
        .exec(db)
        .await?;
    Ok(result.rows_affected)
}

pub async fn list_users(db: &DatabaseConnection) -> Result<Vec<UserRow>, DbErr> {
    user::Entity::find()
        .order_by_asc(user::Column::Username)
        .all(db)
        .await
}

/// Creates a user with a password (already hashed) and no token.
pub async fn insert_user(
    db: &DatabaseConnection,
    username: &str,
    role: &str,
    password_hash: String,
) -> Result<UserRow, DbErr> {
    let now = Utc::now();
    user::ActiveModel {
        id: Set(Uuid::new_v4()),
        username: Set(username.to_owned()),
        password_hash: Set(Some(password_hash)),
        role: Set(role.to_owned()),
        disabled: Set(false),
        created_at: Set(now),
        updated_at: Set(now),
    }
    .insert(db)
    .await
}

/// Disables (or enables) a user. Disabling also deletes the user's sessions,
/// in the same transaction: a disabled user's tokens stop working at once
/// (every request checks `disabled` too), and their sessions never return.
pub async fn set_disabled(
    db: &DatabaseConnection,
    user_id: Uuid,
    disabled: bool,
    session_kind: &str,
) -> Result<Option<UserRow>, DbErr> {
    // The transaction starts with its write: on SQLite a transaction that
    // reads first and writes after fails at once ("database is locked")
    // when another connection wrote in between; one that writes first
    // waits for the lock.
    let txn = db.begin().await?;
    let updated = user::Entity::update_many()
        .col_expr(
            user::Column::Disabled,
            sea_orm::sea_query::Expr::value(disabled),
        )
        .col_expr(
            user::Column::UpdatedAt,
            sea_orm::sea_query::Expr::value(Utc::now()),
        )
        .filter(user::Column::Id.eq(user_id))
        .exec_with_returning(&txn)
        .await?;
    let Some(row) = updated.into_iter().next() else {
        return Ok(None);
    };
    if disabled {
        api_token::Entity::delete_many()
            .filter(api_token::Column::UserId.eq(user_id))
            .filter(api_token::Column::Kind.eq(session_kind))
            .exec(&txn)
            .await?;
    }
    txn.commit().await?;
    Ok(Some(row))
}

pub async fn set_role(
    db: &DatabaseConnection,
    user_id: Uuid,
    role: &str,
) -> Result<Option<UserRow>, DbErr> {
    let Some(row) = user::Entity::find_by_id(user_id).one(db).await? else {
        return Ok(None);
    };
    let mut active = row.into_active_model();
    active.role = Set(role.to_owned());
    active.updated_at = Set(Utc::now());
    active.update(db).await.map(Some)
}

/// Deletes a user; their tokens and memberships go with them (cascade).
pub async fn delete_user(db: &DatabaseConnection, user_id: Uuid) -> Result<bool, DbErr> {
    let txn = db.begin().await?;
    api_token::Entity::delete_many()
        .filter(api_token::Column::UserId.eq(user_id))
        .exec(&txn)
        .await?;
    super::entities::project_member::Entity::delete_many()
        .filter(super::entities::project_member::Column::UserId.eq(user_id))
        .exec(&txn)
        .await?;
    let deleted = user::Entity::delete_by_id(user_id).exec(&txn).await?;
    txn.commit().await?;
    Ok(deleted.rows_affected > 0)
}

/// Users with this server role who are not disabled.
pub async fn count_active_with_role(db: &DatabaseConnection, role: &str) -> Result<u64, DbErr> {
    user::Entity::find()
        .filter(user::Column::Role.eq(role))
        .filter(user::Column::Disabled.eq(false))
        .count(db)
        .await
}
