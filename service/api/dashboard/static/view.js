// DOM helpers. Text only: every value is set with textContent, never parsed as HTML.

export function el(tag, options = {}, ...children) {
  const node = document.createElement(tag);
  if (options.class) node.className = options.class;
  if (options.text !== undefined && options.text !== null) node.textContent = String(options.text);
  for (const [name, value] of Object.entries(options.attrs || {})) node.setAttribute(name, String(value));
  for (const child of children) if (child) node.append(child);
  return node;
}

export function button(label, onClick, className) {
  const node = el("button", { class: className, text: label, attrs: { type: "button" } });
  node.addEventListener("click", onClick);
  return node;
}

export function cell(value, className) {
  return el("td", { class: className, text: value === null || value === undefined ? "—" : value });
}

export function clear(node) {
  node.replaceChildren();
}

// An RFC 3339 time as "YYYY-MM-DD HH:MM:SS UTC" (the raw value in the title).
export function time(value) {
  if (!value) return "—";
  const date = new Date(value);
  if (Number.isNaN(date.getTime())) return String(value);
  return `${date.toISOString().slice(0, 19).replace("T", " ")} UTC`;
}

export function timeCell(value) {
  const td = cell(time(value));
  if (value) td.title = String(value);
  return td;
}

// A value that may break after each `separator` (a <wbr> node, never parsed HTML), whole in
// the title: a URL after "/", an event list after ",".
export function breakableCell(value, separator, className) {
  const td = el("td", { class: className, attrs: { title: value } });
  const parts = String(value).split(separator);
  parts.forEach((part, index) => {
    const last = index === parts.length - 1;
    td.append(document.createTextNode(last ? part : `${part}${separator}`));
    if (!last) td.append(document.createElement("wbr"));
  });
  return td;
}

export function targetCell(value) {
  return breakableCell(value, "/", "target");
}
