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

// A URL that may break after each "/" (a <wbr> node, never parsed HTML), whole in the title.
export function targetCell(value) {
  const td = el("td", { class: "target", attrs: { title: value } });
  const parts = String(value).split("/");
  parts.forEach((part, index) => {
    td.append(document.createTextNode(index < parts.length - 1 ? `${part}/` : part));
    if (index < parts.length - 1) td.append(document.createElement("wbr"));
  });
  return td;
}
