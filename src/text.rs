//! [`bounded`], the one cut of outside text to a size. And enums stored and shown as fixed text (`TO_DEPLOY`, `ADMIN`, `stdout`), all
//! made by one macro, [`text_enum!`]. A leaf: it uses nothing else of the crate.
//!
//! ```ignore
//! text_enum! {
//!     /// Where a node is in its life.
//!     pub enum NodeState {
//!         ToDeploy = "TO_DEPLOY",
//!         Complete = "COMPLETE",
//!     }
//! }
//! ```
//!
//! gives the enum (`Clone, Copy, Debug, PartialEq, Eq, Hash`), `as_str`,
//! `ALL` (every variant, in declaration order), `FromStr` (exact text only,
//! failing with [`UnknownText`]) and `Display` (the text); [`text_serde!`]
//! adds serde as the text. Each area turns
//! `UnknownText` into its own error.

/// A text that names no variant of the enum `kind`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} `{text}`")]
pub struct UnknownText {
    /// The enum's name, e.g. `NodeState`.
    pub kind: &'static str,
    /// The text that was read.
    pub text: String,
}

/// Declares an enum whose variants are stored and shown as the given texts;
/// see the module docs.
macro_rules! text_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $(
                $(#[$variant_meta:meta])*
                $variant:ident = $text:literal
            ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        $vis enum $name {
            $(
                $(#[$variant_meta])*
                $variant,
            )+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: [$name; [$(stringify!($variant)),+].len()] = [$($name::$variant),+];

            /// The text this variant is stored and shown as.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::text::UnknownText;

            /// The exact text only.
            fn from_str(text: &str) -> ::std::result::Result<Self, Self::Err> {
                match text {
                    $($text => Ok($name::$variant),)+
                    other => Err($crate::text::UnknownText {
                        kind: stringify!($name),
                        text: other.to_owned(),
                    }),
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

pub(crate) use text_enum;

/// Serde for enums of [`text_enum!`], as their text (for those without a
/// serde derive of their own).
macro_rules! text_serde {
    ($($name:ty),+ $(,)?) => {
        $(
            impl ::serde::Serialize for $name {
                fn serialize<S: ::serde::Serializer>(&self, s: S) -> ::std::result::Result<S::Ok, S::Error> {
                    s.serialize_str(self.as_str())
                }
            }

            impl<'de> ::serde::Deserialize<'de> for $name {
                fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> ::std::result::Result<Self, D::Error> {
                    let text = <::std::borrow::Cow<'de, str> as ::serde::Deserialize>::deserialize(d)?;
                    text.parse().map_err(::serde::de::Error::custom)
                }
            }
        )+
    };
}

pub(crate) use text_serde;

/// `text` cut to at most `max` bytes at a character boundary, with `marker`
/// appended when it was cut.
pub fn bounded(mut text: String, max: usize, marker: &str) -> String {
    if text.len() > max {
        let mut cut = max;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str(marker);
    }
    text
}

/// A duration in a user's words: `10m`, `90s`, `1h`, `250ms`.
pub fn duration_words(d: std::time::Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.as_millis()),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn texts_are_cut_at_a_character_boundary() {
        assert_eq!(super::bounded("short".into(), 10, "…"), "short");
        assert_eq!(super::bounded("ééé".into(), 3, "…"), "é…");
        let long = super::bounded("x".repeat(10_000), 2048, " …");
        assert_eq!(long.len(), 2048 + " …".len());
    }

    use super::*;

    text_enum! {
        /// A test enum.
        enum Sample {
            /// With a doc comment.
            One = "ONE",
            TwoWords = "TWO_WORDS",
            Lower = "lower",
        }
    }

    #[test]
    fn every_variant_round_trips() {
        assert_eq!(Sample::ALL, [Sample::One, Sample::TwoWords, Sample::Lower]);
        for variant in Sample::ALL {
            assert_eq!(variant.as_str().parse::<Sample>(), Ok(variant));
            assert_eq!(variant.to_string(), variant.as_str());
        }
        assert_eq!(Sample::TwoWords.as_str(), "TWO_WORDS");
        assert_eq!(Sample::Lower.as_str(), "lower");
    }

    #[test]
    fn unknown_text_is_named() {
        let e = "one".parse::<Sample>().unwrap_err();
        assert_eq!(
            e,
            UnknownText {
                kind: "Sample",
                text: "one".into()
            }
        );
        assert_eq!(e.to_string(), "unknown Sample `one`");
        assert!("".parse::<Sample>().is_err());
        assert!("TWO_WORDS ".parse::<Sample>().is_err());
    }
}
