/*
 * /auth/docs: names and keyboard access Swagger UI's markup leaves out
 * (docs/api.md, "Accessibility of /auth/docs"). Swagger UI renders with
 * React, again on every expand, so this runs after each change to the page
 * and only adds attributes React does not manage.
 */
(function () {
  'use strict'
  function name (element, label) {
    if (!element.hasAttribute('aria-label') && !element.hasAttribute('aria-labelledby')) element.setAttribute('aria-label', label)
  }
  function fix (root) {
    var main = root.getElementById('swagger-ui')
    if (main !== null && !main.hasAttribute('role')) main.setAttribute('role', 'main')
    var servers = root.getElementById('servers')
    if (servers !== null) name(servers, 'Server')
    // A parameter's controls (Try it out): named after the parameter and where it goes.
    root.querySelectorAll('tr[data-param-name] input, tr[data-param-name] select, tr[data-param-name] textarea').forEach(function (control) {
      var row = control.closest('tr[data-param-name]')
      name(control, row.getAttribute('data-param-name') + ' (' + row.getAttribute('data-param-in') + ' parameter)')
    })
    // The deep link inside each operation's expand button is a second, nested control for the same thing:
    // the button already opens the operation and puts its address in the location bar (deepLinking).
    root.querySelectorAll('.opblock-summary-control a.nostyle[href]').forEach(function (link) { link.removeAttribute('href') })
    // Examples scroll sideways: focusable, so they can be scrolled with the keyboard.
    root.querySelectorAll('pre.microlight:not([tabindex])').forEach(function (pre) { pre.setAttribute('tabindex', '0') })
  }
  var pending = false
  new MutationObserver(function () {
    if (pending) return
    pending = true
    window.requestAnimationFrame(function () { pending = false; fix(document) })
  }).observe(document.body, { childList: true, subtree: true })
  fix(document)
})()
