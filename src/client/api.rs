//! GraphQL over HTTP: one `POST /graphql` per request, the token as a bearer,
//! the answer's `data` or its first error (message and `extensions.code`).

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::error::ClientError;

/// Connecting may take this long before the server counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// A whole request's deadline: long enough for a password hash on a busy
/// server and for the slowest mutation (`unloadProvider` waits for a stop).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);

/// The API at one server, with or without a token.
#[derive(Clone)]
pub struct Api {
    http: reqwest::Client,
    /// `http://host:port`, no trailing slash.
    pub server: String,
    token: Option<String>,
}

impl Api {
    pub fn new(server: &str, token: Option<String>) -> Result<Api, ClientError> {
        let server = server.trim_end_matches('/').to_owned();
        let parsed = url::Url::parse(&server)
            .map_err(|e| ClientError::Usage(format!("the server URL `{server}`: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(ClientError::Usage(format!(
                "the server URL `{server}` is not http:// or https://"
            )));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .user_agent(concat!("corbel-cli/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ClientError::Transport(format!("cannot make an HTTP client: {e}")))?;
        Ok(Api {
            http,
            server,
            token,
        })
    }

    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The same client for another server.
    pub fn with_server(&self, server: &str) -> Result<Api, ClientError> {
        Api::new(server, self.token.clone())
    }

    pub fn with_token(&self, token: Option<String>) -> Api {
        Api {
            token,
            ..self.clone()
        }
    }

    /// Runs one GraphQL document and returns its `data`.
    pub async fn request(&self, query: &str, variables: Value) -> Result<Value, ClientError> {
        let mut request = self
            .http
            .post(format!("{}/graphql", self.server))
            .json(&json!({ "query": query, "variables": variables }));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let unreachable = |e: reqwest::Error| {
            ClientError::Transport(format!(
                "cannot reach the server at {}: {}",
                self.server,
                super::error_chain(&e)
            ))
        };
        let response = request.send().await.map_err(unreachable)?;
        let status = response.status();
        let body = response.bytes().await.map_err(unreachable)?;
        let Ok(body) = serde_json::from_slice::<Value>(&body) else {
            return Err(ClientError::Transport(format!(
                "the server at {} answered {status} without GraphQL JSON: is it a Corbel server?",
                self.server
            )));
        };
        if let Some(first) = body["errors"].as_array().and_then(|e| e.first()) {
            return Err(ClientError::Api {
                code: first["extensions"]["code"]
                    .as_str()
                    .unwrap_or("ERROR")
                    .to_owned(),
                message: first["message"]
                    .as_str()
                    .unwrap_or("an error without a message")
                    .to_owned(),
            });
        }
        match body.get("data") {
            Some(data) if !data.is_null() => Ok(data.clone()),
            _ => Err(ClientError::Transport(format!(
                "the server at {} answered {status} with neither data nor errors",
                self.server
            ))),
        }
    }

    /// [`Self::request`], then the value under `field` of `data` as a `T`.
    pub async fn get<T: DeserializeOwned>(
        &self,
        query: &str,
        variables: Value,
        field: &str,
    ) -> Result<T, ClientError> {
        let data = self.request(query, variables).await?;
        serde_json::from_value(data[field].clone()).map_err(|e| {
            ClientError::Transport(format!(
                "the server's `{field}` is not what this client reads: {e}"
            ))
        })
    }

    /// Every node of a Relay connection at the root field `field`, page by
    /// page: `selection` is what to read of each node; `filter`, the type
    /// and value of the field's `filter` argument, if it is given one.
    pub async fn all(
        &self,
        field: &str,
        filter: Option<(&str, Value)>,
        selection: &str,
    ) -> Result<Vec<Value>, ClientError> {
        const PAGE: i32 = 500;
        let (declared, passed, filter) = match filter {
            Some((kind, value)) => (format!(", $filter: {kind}"), "filter: $filter, ", value),
            None => (String::new(), "", Value::Null),
        };
        let query = format!(
            "query($first: Int, $after: String{declared}) {{ {field}({passed}first: $first, after: $after) \
             {{ nodes {{ {selection} }} pageInfo {{ hasNextPage endCursor }} }} }}"
        );
        let mut nodes = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let mut variables = json!({ "first": PAGE, "after": after });
            if !filter.is_null() {
                variables["filter"] = filter.clone();
            }
            let page = self.request(&query, variables).await?;
            let page = &page[field];
            nodes.extend(page["nodes"].as_array().cloned().unwrap_or_default());
            match page["pageInfo"]["endCursor"].as_str() {
                Some(cursor) if page["pageInfo"]["hasNextPage"] == true => {
                    after = Some(cursor.to_owned());
                }
                _ => return Ok(nodes),
            }
        }
    }
}
