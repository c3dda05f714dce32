// Passkey buttons of gatehouse's sign-in and account pages. The browser's
// WebAuthn call runs here (through @simplewebauthn/browser, served next to
// this file); the result goes back in the button's own form, so the server
// answers as for any other form post. Without JavaScript the code fields
// still work.
(function () {
  'use strict'
  const webauthn = window.SimpleWebAuthnBrowser
  const base = document.documentElement.getAttribute('data-base') || ''

  async function post (path, body) {
    const response = await fetch(base + path, {
      method: 'POST',
      credentials: 'same-origin',
      headers: body === undefined ? {} : { 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body)
    })
    const data = await response.json()
    if (!response.ok) throw new Error(data.detail || response.statusText)
    return data
  }

  async function ceremony (mode, form) {
    if (mode === 'challenge') {
      return await post('/api/login/mfa/passkey-options', { challenge_token: form.elements.challenge_token.value })
    }
    if (mode === 'passwordless') return await post('/api/login/passkey/options')
    return await post('/api/me/passkeys/options')
  }

  for (const button of document.querySelectorAll('button[data-passkey]')) {
    button.hidden = false
    button.addEventListener('click', async function (event) {
      event.preventDefault()
      const form = button.form
      const status = document.getElementById('passkey-status')
      if (status) status.textContent = ''
      try {
        if (!webauthn || !webauthn.browserSupportsWebAuthn()) throw new Error('This browser does not support passkeys.')
        const { options, ceremony: kind } = await ceremony(button.getAttribute('data-passkey'), form)
        const credential = kind === 'create'
          ? await webauthn.startRegistration({ optionsJSON: options })
          : await webauthn.startAuthentication({ optionsJSON: options })
        form.elements.passkey.value = JSON.stringify(credential)
        form.submit()
      } catch (error) {
        if (status) status.textContent = 'The passkey did not work: ' + (error && error.message ? error.message : String(error))
      }
    })
  }
})()
