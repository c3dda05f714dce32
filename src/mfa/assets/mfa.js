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
    if (!response.ok) {
      const error = new Error(data.detail || response.statusText)
      error.code = data.code
      throw error
    }
    return data
  }

  async function ceremony (mode, form) {
    if (mode === 'challenge') {
      return await post('/api/login/mfa/passkey-options', { challenge_token: form.elements.challenge_token.value })
    }
    if (mode === 'passwordless') return await post('/api/login/passkey/options')
    if (mode === 'reauth') return await post('/api/me/reauthenticate/passkey-options')
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
        // Adding a passkey to a session signed in too long ago: the account page asks the person to confirm first.
        if (error && error.code === 'reauthentication_required') {
          window.location.assign(base + '/account?reauthenticate=1')
          return
        }
        if (status) status.textContent = 'The passkey did not work: ' + (error && error.message ? error.message : String(error))
      }
    })
  }

  // Recovery codes: copy them to the clipboard, or save them as a text file.
  const codeList = document.getElementById('recovery-codes')
  if (codeList) {
    const text = Array.from(codeList.querySelectorAll('code'), function (code) { return code.textContent }).join('\n') + '\n'
    const codesStatus = document.getElementById('codes-status')
    const copy = document.getElementById('copy-codes')
    const download = document.getElementById('download-codes')
    if (copy && navigator.clipboard) {
      copy.hidden = false
      copy.addEventListener('click', async function () {
        try {
          await navigator.clipboard.writeText(text)
          codesStatus.textContent = 'Copied.'
        } catch (error) {
          codesStatus.textContent = 'Could not copy: ' + (error && error.message ? error.message : String(error))
        }
      })
    }
    if (download) {
      download.hidden = false
      download.addEventListener('click', function () {
        const link = document.createElement('a')
        link.href = URL.createObjectURL(new Blob([text], { type: 'text/plain' }))
        link.download = 'gatehouse-recovery-codes.txt'
        document.body.appendChild(link)
        link.click()
        link.remove()
        setTimeout(function () { URL.revokeObjectURL(link.href) }, 60000)
        codesStatus.textContent = 'Saved as gatehouse-recovery-codes.txt.'
      })
    }
  }
})()
