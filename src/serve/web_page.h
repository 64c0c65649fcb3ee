// The page `colossal serve` shows at /: one self-contained HTML file (no script or style from elsewhere)
// where a person types a prompt and watches the completion stream in, through the same
// /v1/completions endpoint clients use (server-sent events). `?prompt=...&auto=1` fills and submits the
// form on load, and the page marks <body data-state="done"> when the stream ends (for the browser test).
#pragma once
#include <string>

namespace colossal::serve {

const std::string& web_page();

}  // namespace colossal::serve
