// A delivery's payload exactly as it was sent: the text of the API's answer, never parsed
// and written again (JSON.parse would make an amount of 1.00 the number 1, and drop the
// order and the spelling of what the receiver got).

const SPACE = " \t\r\n";

// The text of the member `name` of the JSON object `text`, exactly as written, or null.
export function rawMember(text, name) {
  let at = 0;
  const skipSpace = () => {
    while (at < text.length && SPACE.includes(text[at])) at += 1;
  };
  const skipString = () => { // at its opening quote
    at += 1;
    while (at < text.length && text[at] !== '"') at += text[at] === "\\" ? 2 : 1;
    at += 1;
  };
  const skipValue = () => {
    skipSpace();
    const start = at;
    if (text[at] === '"') {
      skipString();
    } else if (text[at] === "{" || text[at] === "[") {
      let depth = 0;
      while (at < text.length) {
        const c = text[at];
        if (c === '"') { skipString(); continue; }
        if (c === "{" || c === "[") depth += 1;
        if (c === "}" || c === "]") depth -= 1;
        at += 1;
        if (depth === 0) break;
      }
    } else {
      while (at < text.length && !",}]".includes(text[at]) && !SPACE.includes(text[at])) at += 1;
    }
    return start;
  };
  skipSpace();
  if (text[at] !== "{") return null;
  at += 1;
  while (at < text.length) {
    skipSpace();
    if (text[at] !== '"') return null;
    const keyStart = at;
    skipString();
    let key;
    try { key = JSON.parse(text.slice(keyStart, at)); } catch { return null; }
    skipSpace();
    if (text[at] !== ":") return null;
    at += 1;
    const start = skipValue();
    if (key === name) return text.slice(start, at);
    skipSpace();
    if (text[at] !== ",") return null;
    at += 1;
  }
  return null;
}

// The same JSON text indented two spaces a level: only the whitespace between its tokens
// changes; every string and number is kept as written.
export function indented(text) {
  let out = "";
  let depth = 0;
  let at = 0;
  const newline = () => `\n${"  ".repeat(depth)}`;
  while (at < text.length) {
    const c = text[at];
    if (c === '"') {
      const start = at;
      at += 1;
      while (at < text.length && text[at] !== '"') at += text[at] === "\\" ? 2 : 1;
      at += 1;
      out += text.slice(start, at);
      continue;
    }
    at += 1;
    if (SPACE.includes(c)) continue;
    if (c === "{" || c === "[") {
      let next = at;
      while (next < text.length && SPACE.includes(text[next])) next += 1;
      if (text[next] === (c === "{" ? "}" : "]")) { // empty: {} or []
        out += c + text[next];
        at = next + 1;
        continue;
      }
      depth += 1;
      out += c + newline();
    } else if (c === "}" || c === "]") {
      depth -= 1;
      out += newline() + c;
    } else if (c === ",") {
      out += c + newline();
    } else if (c === ":") {
      out += ": ";
    } else {
      out += c;
    }
  }
  return out;
}
