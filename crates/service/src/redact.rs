//! Secrets kept out of messages: URLs without their passwords and queries, and errors with
//! their causes.

/// A URL for messages: without the password of its credentials, and without its query (where
/// webhook receivers often take a token).
pub fn redact(url: &str) -> String {
    let url = match url.split_once('?') {
        Some((base, _)) => return redact(base) + "?***",
        None => url,
    };
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let creds = &url[scheme + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// An error with its causes, `a: b: c`, as reqwest's own message hides the cause (connection
/// refused, DNS) behind "error sending request".
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    redact_urls(&text)
}

/// Text with every URL in it redacted, as [`redact`] does one: for error messages from
/// libraries that quote the URL they failed on.
pub fn redact_urls(text: &str) -> String {
    text.split(' ')
        .map(|word| match word.find("://") {
            Some(at) if at > 0 => {
                let start = word[..at].rfind(|c: char| !c.is_ascii_alphanumeric() && c != '+').map_or(0, |i| i + 1);
                let end = word[at..].find(['"', '\'', ')', '>']).map_or(word.len(), |i| at + i);
                format!("{}{}{}", &word[..start], redact(&word[start..end]), &word[end..])
            }
            _ => word.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    #[test]
    fn urls_inside_messages_are_redacted() {
        assert_eq!(
            super::redact_urls("error sending request for url (https://h/x?token=abc): refused"),
            "error sending request for url (https://h/x?***): refused"
        );
        assert_eq!(super::redact_urls("no url here"), "no url here");
        assert_eq!(super::redact_urls("\"postgres://u:pw@db/x\" down"), "\"postgres://u:***@db/x\" down");
    }

    #[test]
    fn secrets_stay_out_of_messages() {
        assert_eq!(super::redact("postgres://vigil:s3cret@db:5432/vigil"), "postgres://vigil:***@db:5432/vigil");
        assert_eq!(super::redact("https://hooks.example/x?token=abc"), "https://hooks.example/x?***");
        assert_eq!(super::redact("https://u:p@h/x?t=1"), "https://u:***@h/x?***");
        assert_eq!(super::redact("sqlite://vigil.db"), "sqlite://vigil.db");
    }
}
