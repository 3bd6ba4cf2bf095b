//! Text a peer chose, made safe to print: a relay's error message, a connection's close reason,
//! a certificate's name.
//!
//! Written to a log line or a terminal as it came, such text could end the line and start
//! another (forging a line that a person or a program reads as ours), or move the cursor,
//! recolour or retitle a terminal. [`Escaped`] writes it with every character that could do so
//! replaced by its Rust escape (`\n`, `\r`, `\t`, `\u{1b}`, `\u{2028}`) and every other
//! character as it is. Backslashes are left alone, so escaping twice changes nothing: text
//! escaped where it enters an error and again where the log writes it reads the same.
//!
//! Every binary's log writer escapes each field this way (`ledger_relay_cli::logging`), and
//! errors that quote a peer escape the quote in their `Display`, so that the text stays safe
//! when a library user prints it.

use std::fmt::{self, Write as _};

/// Displays `T` with every character that [`needs_escape`] replaced by its escape.
///
/// ```
/// use ledger_relay_wire::text::Escaped;
/// let forged = "busy\nbelow-retention requested=1\x1b[2J";
/// assert_eq!(
///     Escaped(forged).to_string(),
///     r"busy\nbelow-retention requested=1\u{1b}[2J"
/// );
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Escaped<T>(pub T);

impl<T: fmt::Display> fmt::Display for Escaped<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(EscapingWriter(f), "{}", self.0)
    }
}

/// A writer that escapes what passes through it, for callers that format into a
/// [`fmt::Write`] themselves (a log formatter).
#[derive(Debug)]
pub struct EscapingWriter<W>(pub W);

impl<W: fmt::Write> fmt::Write for EscapingWriter<W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut rest = s;
        while let Some((at, c)) = rest.char_indices().find(|(_, c)| needs_escape(*c)) {
            self.0.write_str(&rest[..at])?;
            write!(self.0, "{}", c.escape_default())?;
            rest = &rest[at + c.len_utf8()..];
        }
        self.0.write_str(rest)
    }
}

/// `s` escaped (see [`Escaped`]); borrowed when nothing needed escaping.
pub fn escape(s: &str) -> std::borrow::Cow<'_, str> {
    if s.chars().any(needs_escape) {
        std::borrow::Cow::Owned(Escaped(s).to_string())
    } else {
        std::borrow::Cow::Borrowed(s)
    }
}

/// Whether `c` can end a line, act on a terminal, or change how the text around it is shown:
/// the control characters (C0, DEL, C1: newline, carriage return, escape, backspace...), the
/// Unicode line and paragraph separators, and the bidirectional marks, embeddings, overrides
/// and isolates (which can make a line read differently from its bytes).
pub fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
        )
}

/// Cuts `s` to at most `max` bytes at a character boundary.
pub fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn line_breaks_and_terminal_controls_are_escaped() {
        let cases = [
            ("a\nb", r"a\nb"),
            ("a\r\nb", r"a\r\nb"),
            ("tab\there", r"tab\there"),
            ("\x1b[31mred\x1b[0m", r"\u{1b}[31mred\u{1b}[0m"),
            ("bell\x07", r"bell\u{7}"),
            ("del\x7f", r"del\u{7f}"),
            ("c1\u{9b}31m", r"c1\u{9b}31m"),
            ("sep\u{2028}x", r"sep\u{2028}x"),
            ("rtl\u{202e}txt", r"rtl\u{202e}txt"),
            ("nul\0", r"nul\u{0}"),
        ];
        for (raw, want) in cases {
            assert_eq!(Escaped(raw).to_string(), want, "{raw:?}");
            assert_eq!(escape(raw), want, "{raw:?}");
        }
    }

    #[test]
    fn printable_text_is_left_as_it_is() {
        for s in [
            "",
            "ledger 5 is below the retention",
            r#"quotes " and ' and a \ backslash"#,
            "ünïcödé, 漢字, emoji 🚀",
        ] {
            assert_eq!(Escaped(s).to_string(), s);
            assert!(matches!(escape(s), std::borrow::Cow::Borrowed(_)));
        }
    }

    #[test]
    fn anything_displayable_is_escaped() {
        let e = std::io::Error::other("closed by peer: x\ny");
        assert_eq!(Escaped(&e).to_string(), r"closed by peer: x\ny");
        assert_eq!(
            Escaped(format_args!("{}-{}", "a\n", 1)).to_string(),
            r"a\n-1"
        );
    }

    proptest! {
        #[test]
        fn escaped_text_is_one_safe_line_and_escaping_is_idempotent(s in any::<String>()) {
            let once = Escaped(&s).to_string();
            prop_assert!(!once.chars().any(needs_escape), "{:?}", once);
            prop_assert_eq!(Escaped(&once).to_string(), once.clone());
            // Characters that need no escape pass through in order.
            let kept: String = s.chars().filter(|c| !needs_escape(*c)).collect();
            let mut rest = once.as_str();
            for c in kept.chars() {
                let at = rest.find(c);
                prop_assert!(at.is_some(), "{:?} lost from {:?}", c, once);
                rest = &rest[at.unwrap_or(0) + c.len_utf8()..];
            }
        }
    }
}
