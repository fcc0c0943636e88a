//! The lexer under [`check_statement`](super::lexical::check_statement):
//! SQL text as words, quoted identifiers, semicolons and the rest, with
//! string literals, comments and dollar-quoted bodies skipped. Text that
//! Postgres and SQLite would split differently is refused here.

/// Why a statement was refused; the text goes back to the plugin.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GuardError {
    #[error("empty statement")]
    Empty,
    #[error("statement is {len} bytes; the limit is {max}")]
    TooLong { len: usize, max: usize },
    #[error("only one statement per call; found `;` followed by more SQL")]
    MultipleStatements,
    #[error("`{0}` statements are not allowed; send a single SELECT, INSERT, UPDATE or DELETE")]
    NotDml(String),
    #[error("`{0}` is not allowed in plugin SQL: the host owns the transaction and the session")]
    Forbidden(String),
    #[error("a statement must start with SELECT, INSERT, UPDATE, DELETE or WITH")]
    NoLeadingKeyword,
    #[error("unterminated {0}")]
    Unterminated(&'static str),
    #[error(
        "{0} is not accepted (Postgres and SQLite read it differently); bind the value as a parameter"
    )]
    Ambiguous(&'static str),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Token {
    Word(String),
    /// A quoted identifier: never a keyword, but possibly a function name.
    Quoted(String),
    Semicolon,
    /// `(`, which may come before the first keyword.
    Open,
    Other,
}

/// Splits SQL into words, semicolons and the rest, skipping string
/// literals, quoted identifiers, dollar-quoted bodies and comments, so a
/// keyword inside a string is not mistaken for one outside it.
pub(crate) fn tokenize(sql: &str) -> Result<Vec<Token>, GuardError> {
    let b = sql.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match c {
            b';' => {
                out.push(Token::Semicolon);
                i += 1;
            }
            b'\'' | b'"' if is_unicode_escape_prefix(b, i) => {
                return Err(GuardError::Ambiguous("a U& escape"));
            }
            b'\'' => {
                let (end, body) =
                    skip_quoted(b, i, b'\'').ok_or(GuardError::Unterminated("string literal"))?;
                // Backslashes are plain characters in standard strings but
                // escapes in Postgres E'…' strings (and everywhere with
                // standard_conforming_strings off): one before a quote would
                // end the literal in a different place.
                if body.windows(2).any(|w| w == b"\\'") || body.last() == Some(&b'\\') {
                    return Err(GuardError::Ambiguous("a backslash before a quote"));
                }
                i = end;
                out.push(Token::Other);
            }
            b'"' => {
                // A quoted identifier is a name, never a keyword, but it
                // may name a function.
                let (end, body) =
                    skip_quoted(b, i, c).ok_or(GuardError::Unterminated("quoted identifier"))?;
                i = end;
                out.push(Token::Quoted(
                    String::from_utf8_lossy(body).to_ascii_lowercase(),
                ));
            }
            b'[' => {
                // SQLite's [identifier] is a subscript to Postgres. Its
                // content is read as SQL (the stricter way), but only when
                // nothing in it would start a string, a comment or another
                // statement: SQLite would not see those.
                let end = b[i..]
                    .iter()
                    .position(|&x| x == b']')
                    .ok_or(GuardError::Unterminated("bracket"))?;
                let inside = &b[i + 1..i + end];
                if inside
                    .iter()
                    .any(|x| matches!(x, b'\'' | b'"' | b'`' | b';'))
                    || inside.windows(2).any(|w| w == b"--" || w == b"/*")
                {
                    return Err(GuardError::Ambiguous("a quote, `;` or comment inside [ ]"));
                }
                out.push(Token::Other);
                i += 1;
            }
            b'`' => {
                // An identifier quote to SQLite, an operator character to
                // Postgres.
                return Err(GuardError::Ambiguous("a backtick"));
            }
            b'-' if b.get(i + 1) == Some(&b'-') => {
                // Postgres ends a line comment at CR as well as LF, SQLite
                // only at LF: a lone CR would leave text that is code to one
                // and comment to the other.
                let end = b[i..]
                    .iter()
                    .position(|&x| x == b'\n' || x == b'\r')
                    .map(|p| i + p);
                if let Some(e) = end
                    && b[e] == b'\r'
                    && e + 1 < b.len()
                    && b[e + 1] != b'\n'
                {
                    return Err(GuardError::Ambiguous(
                        "a carriage return inside a -- comment",
                    ));
                }
                i = end.map_or(b.len(), |e| e + 1);
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                // Postgres nests block comments and SQLite does not.
                i += 2;
                loop {
                    if i + 1 >= b.len() {
                        return Err(GuardError::Unterminated("block comment"));
                    }
                    if b[i] == b'/' && b[i + 1] == b'*' {
                        return Err(GuardError::Ambiguous("a nested block comment"));
                    }
                    if b[i] == b'*' && b[i + 1] == b'/' {
                        i += 2;
                        break;
                    }
                    i += 1;
                }
            }
            b'$' => {
                // $1 parameter, or a $tag$ ... $tag$ dollar-quoted string.
                let tag_end = b[i + 1..]
                    .iter()
                    // Postgres tags may hold any non-ASCII letter, too.
                    .position(|&x| !(x.is_ascii_alphanumeric() || x == b'_' || x >= 0x80))
                    .map(|p| i + 1 + p);
                match tag_end {
                    Some(e)
                        if b[e] == b'$' && !b[i + 1..e].first().is_some_and(u8::is_ascii_digit) =>
                    {
                        // SQLite has no dollar quotes: what Postgres reads
                        // as a string, SQLite runs as SQL.
                        return Err(GuardError::Ambiguous("a dollar-quoted string"));
                    }
                    _ => {
                        i += 1;
                        while i < b.len() && b[i].is_ascii_digit() {
                            i += 1;
                        }
                        out.push(Token::Other);
                    }
                }
            }
            c if c.is_ascii_alphabetic() || c == b'_' || c >= 0x80 => {
                let start = i;
                // Both databases allow `$` inside a name: `select$` is a
                // name, not SELECT.
                while i < b.len()
                    && (b[i].is_ascii_alphanumeric()
                        || b[i] == b'_'
                        || b[i] == b'$'
                        || b[i] >= 0x80)
                {
                    i += 1;
                }
                // A word directly after E or e followed by a quote is an
                // escape string; the quote is handled on the next turn.
                out.push(Token::Word(sql[start..i].to_ascii_lowercase()));
            }
            b'(' => {
                out.push(Token::Open);
                i += 1;
            }
            _ => {
                if !c.is_ascii_whitespace() {
                    out.push(Token::Other);
                }
                i += 1;
            }
        }
    }
    Ok(out)
}

/// Index just past the closing `quote` starting at `start`, and the bytes
/// between the quotes; a doubled quote stays inside.
fn skip_quoted(b: &[u8], start: usize, quote: u8) -> Option<(usize, &[u8])> {
    let mut i = start + 1;
    while i < b.len() {
        if b[i] == quote {
            if b.get(i + 1) == Some(&quote) {
                i += 2;
                continue;
            }
            return Some((i + 1, &b[start + 1..i]));
        }
        i += 1;
    }
    None
}

/// `U&'…'` or `U&"…"`: Postgres decodes `\XXXX` escapes inside, so a
/// quoted name could spell a forbidden function.
fn is_unicode_escape_prefix(b: &[u8], quote: usize) -> bool {
    quote >= 2 && b[quote - 1] == b'&' && b[quote - 2].eq_ignore_ascii_case(&b'u')
}
