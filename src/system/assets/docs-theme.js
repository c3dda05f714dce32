// /auth/docs: names and keyboard access Swagger UI's markup leaves out
// (docs/api.md, "Accessibility of /auth/docs"). Swagger UI renders with
// React, again on every expand, so this runs after each change to the page
// and only adds or removes attributes React does not change once rendered.
'use strict'

function nameControl (element, label) {
  if (!element.hasAttribute('aria-label') && !element.hasAttribute('aria-labelledby')) element.setAttribute('aria-label', label)
}

function fixDocsPage () {
  const main = document.getElementById('swagger-ui')
  if (main !== null && !main.hasAttribute('role')) main.setAttribute('role', 'main')
  const servers = document.getElementById('servers')
  if (servers !== null) nameControl(servers, 'Server')
  // A parameter's controls (Try it out): named after the parameter and where it goes.
  for (const control of document.querySelectorAll('tr[data-param-name] input, tr[data-param-name] select, tr[data-param-name] textarea')) {
    const row = control.closest('tr[data-param-name]')
    nameControl(control, `${row.getAttribute('data-param-name')} (${row.getAttribute('data-param-in')} parameter)`)
  }
  // The deep link inside each operation's expand button is a second control nested in the first: the
  // button already opens the operation and puts its address in the location bar (deepLinking).
  for (const link of document.querySelectorAll('.opblock-summary-control a.nostyle[href]')) link.removeAttribute('href')
  // Examples scroll sideways: focusable, so that the keyboard can scroll them.
  for (const pre of document.querySelectorAll('pre.microlight:not([tabindex])')) pre.setAttribute('tabindex', '0')
}

let scheduled = false
new window.MutationObserver(() => {
  if (scheduled) return
  scheduled = true
  window.requestAnimationFrame(() => {
    scheduled = false
    fixDocsPage()
  })
}).observe(document.body, { childList: true, subtree: true })
fixDocsPage()
