// The served web page: see web_page.h.
#include "src/serve/web_page.h"

namespace colossal::serve {

const std::string& web_page() {
  static const std::string page = R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>colossal serve</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:15px/1.5 system-ui,sans-serif;max-width:52rem;margin:2rem auto;padding:0 1rem;color:#222}
textarea,input{font:inherit;width:100%;box-sizing:border-box;padding:.5rem;border:1px solid #bbb;border-radius:4px}
textarea{height:7rem} .row{display:flex;gap:1rem;margin:.6rem 0} .row label{flex:1}
button{font:inherit;padding:.4rem 1.2rem;border-radius:4px;border:1px solid #345;background:#345;color:#fff;cursor:pointer}
button:disabled{opacity:.5} pre{white-space:pre-wrap;background:#f6f6f6;padding:1rem;border-radius:4px;min-height:4rem}
#out b{font-weight:normal;color:#777} small{color:#666}
</style></head>
<body data-state="idle">
<h1>colossal serve</h1>
<p><small id="model">model: ...</small></p>
<form id="form">
<textarea id="prompt" placeholder="Type a prompt">In the beginning</textarea>
<div class="row">
<label>max tokens <input id="max_tokens" type="number" min="1" value="64"></label>
<label>temperature <input id="temperature" type="number" min="0" max="2" step="0.1" value="0.8"></label>
<label>API key <input id="key" type="password" placeholder="(if the server needs one)"></label>
</div>
<button id="go" type="submit">Generate</button> <small id="status"></small>
</form>
<pre id="out"></pre>
<script>
const $ = id => document.getElementById(id);
const params = new URLSearchParams(location.search);
if (params.has('prompt')) $('prompt').value = params.get('prompt');
if (params.has('max_tokens')) $('max_tokens').value = params.get('max_tokens');
if (params.has('temperature')) $('temperature').value = params.get('temperature');
fetch('/v1/models').then(r => r.json()).then(j => { $('model').textContent = 'model: ' + j.data[0].id; }).catch(() => {});
function headers() {
  const h = {'Content-Type': 'application/json'};
  if ($('key').value) h['Authorization'] = 'Bearer ' + $('key').value;
  return h;
}
async function generate() {
  const out = $('out'), started = performance.now();
  out.textContent = ''; const echo = document.createElement('b'); echo.textContent = $('prompt').value; out.appendChild(echo);
  $('go').disabled = true; document.body.dataset.state = 'streaming'; $('status').textContent = 'waiting...';
  let tokens = 0;
  try {
    const res = await fetch('/v1/completions', {method: 'POST', headers: headers(), body: JSON.stringify({
      prompt: $('prompt').value, max_tokens: Number($('max_tokens').value), temperature: Number($('temperature').value), stream: true})});
    if (!res.ok) { const e = await res.json().catch(() => ({error: {message: res.statusText}})); throw new Error(e.error.message); }
    const reader = res.body.getReader(), decoder = new TextDecoder();
    let buffer = '';
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, {stream: true});
      for (let cut; (cut = buffer.indexOf('\n\n')) >= 0; buffer = buffer.slice(cut + 2)) {
        const event = buffer.slice(0, cut);
        if (!event.startsWith('data: ') || event === 'data: [DONE]') continue;
        for (const c of JSON.parse(event.slice(6)).choices) { out.appendChild(document.createTextNode(c.text)); if (c.text) tokens++; }
        $('status').textContent = tokens + ' pieces, ' + ((performance.now() - started) / 1000).toFixed(1) + ' s';
      }
    }
    document.body.dataset.state = 'done';
  } catch (err) {
    $('status').textContent = 'error: ' + err.message; document.body.dataset.state = 'error';
  } finally { $('go').disabled = false; }
}
$('form').addEventListener('submit', e => { e.preventDefault(); generate(); });
if (params.get('auto') === '1') generate();
</script>
</body></html>
)HTML";
  return page;
}

}  // namespace colossal::serve
