//! Relay connections (`first`, `after`, `edges { node }`, `pageInfo`,
//! `totalCount`). Cursors are opaque strings; today they hold an offset.
//!
//! Every list in the API pages through here: a list read whole goes through
//! [`paginate`]; a list the store pages asks [`window`] for the offset and
//! limit to fetch and hands the page to [`page_of`].

use std::sync::Arc;

use async_graphql::connection::{Connection, Edge, EmptyFields};
use async_graphql::{Object, OutputType};
use futures_util::future::BoxFuture;

use super::ApiError;

/// Largest page a client may ask for.
pub const MAX_PAGE: i32 = 500;
/// Page size when `first` is not given.
pub const DEFAULT_PAGE: i32 = 50;

/// A page's `totalCount`: known when the page was made, or counted only if
/// a client asks for it (over a large table, counting every match costs
/// more than the page itself).
pub struct Totals(Total);

/// A count made when asked.
pub type Count = Arc<dyn Fn() -> BoxFuture<'static, Result<u64, ApiError>> + Send + Sync>;

enum Total {
    Known(usize),
    Later(Count),
}

impl Totals {
    pub fn known(total: u64) -> Totals {
        Totals(Total::Known(usize::try_from(total).unwrap_or(usize::MAX)))
    }
}

#[Object]
impl Totals {
    /// How many items there are in all, on every page.
    async fn total_count(&self) -> Result<usize, ApiError> {
        match &self.0 {
            Total::Known(n) => Ok(*n),
            Total::Later(count) => Ok(usize::try_from(count().await?).unwrap_or(usize::MAX)),
        }
    }
}

pub type Page<T> = Connection<String, T, Totals, EmptyFields>;

/// The window (`offset`, `limit`) a `first`/`after` pair asks for, so a store
/// query can fetch just that page.
pub fn window(first: Option<i32>, after: Option<String>) -> Result<(u64, u64), ApiError> {
    let first = page_size(first)?;
    let offset = match after {
        None => 0,
        Some(cursor) => cursor
            .parse::<u64>()
            .map(|offset| offset + 1)
            .map_err(|_| ApiError::validation("`after` is not a cursor from this list"))?,
    };
    Ok((offset, first))
}

/// How many items `first` asks for: [`DEFAULT_PAGE`] when not given,
/// `VALIDATION` outside 0 to [`MAX_PAGE`].
pub fn page_size(first: Option<i32>) -> Result<u64, ApiError> {
    match first {
        None => Ok(DEFAULT_PAGE as u64),
        Some(n) if (0..=MAX_PAGE).contains(&n) => Ok(n as u64),
        Some(n) => Err(ApiError::validation(format!(
            "`first` must be between 0 and {MAX_PAGE}, not {n}"
        ))),
    }
}

/// A page fetched at `offset` out of `total`, as a connection.
pub fn page_of<T: OutputType>(items: Vec<T>, offset: u64, total: u64) -> Page<T> {
    let end = offset + items.len() as u64;
    let page = Connection::with_additional_fields(offset > 0, end < total, Totals::known(total));
    with_edges(page, items, offset)
}

/// A page fetched at `offset` with up to one item more than it shows (that
/// one says whether a next page exists), its total counted by `count` only
/// if asked.
pub fn page_counted_later<T: OutputType>(
    mut items: Vec<T>,
    offset: u64,
    limit: u64,
    count: Count,
) -> Page<T> {
    let more = items.len() as u64 > limit;
    items.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    let page = Connection::with_additional_fields(offset > 0, more, Totals(Total::Later(count)));
    with_edges(page, items, offset)
}

fn with_edges<T: OutputType>(mut page: Page<T>, items: Vec<T>, offset: u64) -> Page<T> {
    page.edges.extend(
        items
            .into_iter()
            .enumerate()
            .map(|(i, item)| Edge::new((offset + i as u64).to_string(), item)),
    );
    page
}

/// One page of `items` (already in order), as a connection.
pub fn paginate<T: OutputType>(
    items: Vec<T>,
    first: Option<i32>,
    after: Option<String>,
) -> Result<Page<T>, ApiError> {
    let (offset, limit) = window(first, after)?;
    let total = items.len() as u64;
    let page = items
        .into_iter()
        .skip(usize::try_from(offset).unwrap_or(usize::MAX))
        .take(usize::try_from(limit).unwrap_or(usize::MAX))
        .collect();
    Ok(page_of(page, offset, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_walk_the_whole_list() {
        let page = paginate((0..5).collect::<Vec<i32>>(), Some(2), None).unwrap();
        assert_eq!(page.edges.len(), 2);
        assert!(page.has_next_page && !page.has_previous_page);
        let last = page.edges.last().unwrap().cursor.clone();
        let page = paginate((0..5).collect::<Vec<i32>>(), Some(10), Some(last)).unwrap();
        assert_eq!(
            page.edges.iter().map(|e| e.node).collect::<Vec<_>>(),
            [2, 3, 4]
        );
        assert!(!page.has_next_page);
        assert!(paginate(vec![1], Some(-1), None).is_err());
        assert!(paginate(vec![1], None, Some("x".into())).is_err());
    }
}
