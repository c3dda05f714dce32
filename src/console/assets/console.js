// gatehouse admin console: progressive enhancement only. Every action works
// without this script (forms post to the server); with it, secrets get a copy
// button and risky actions a confirmation dialog.
'use strict'

function announce (text) {
  const region = document.getElementById('live')
  if (region !== null) region.textContent = text
}

async function copyText (text) {
  if (navigator.clipboard !== undefined && window.isSecureContext) {
    await navigator.clipboard.writeText(text)
    return
  }
  // Plain HTTP by a name other than localhost has no clipboard API.
  const area = document.createElement('textarea')
  area.value = text
  area.setAttribute('readonly', '')
  area.className = 'visually-hidden'
  document.body.appendChild(area)
  area.select()
  document.execCommand('copy')
  area.remove()
}

for (const button of document.querySelectorAll('button[data-copy]')) {
  const target = document.getElementById(button.dataset.copy)
  if (target === null) continue
  button.hidden = false
  button.addEventListener('click', () => {
    copyText(target.textContent).then(
      () => { button.textContent = 'Copied'; announce('Copied to the clipboard.') },
      () => { announce('Could not copy; select the text and copy it by hand.') }
    )
  })
}

let dialog = null
function confirmDialog () {
  if (dialog !== null) return dialog
  dialog = document.createElement('dialog')
  dialog.setAttribute('aria-labelledby', 'confirm-text')
  const text = document.createElement('p')
  text.id = 'confirm-text'
  const form = document.createElement('form')
  form.method = 'dialog'
  form.className = 'actions'
  const yes = document.createElement('button')
  yes.value = 'yes'
  yes.className = 'danger'
  const no = document.createElement('button')
  no.value = 'no'
  no.className = 'secondary'
  no.textContent = 'Cancel'
  form.append(yes, no)
  dialog.append(text, form)
  document.body.appendChild(dialog)
  return dialog
}

for (const form of document.querySelectorAll('form[data-confirm]')) {
  form.addEventListener('submit', (event) => {
    if (form.dataset.confirmed === 'yes' || typeof HTMLDialogElement !== 'function') return
    event.preventDefault()
    const d = confirmDialog()
    d.querySelector('p').textContent = form.dataset.confirm
    const yes = d.querySelector('button[value=yes]')
    yes.textContent = form.dataset.confirmLabel ?? 'Confirm'
    d.returnValue = ''
    d.addEventListener('close', () => {
      if (d.returnValue !== 'yes') return
      form.dataset.confirmed = 'yes'
      form.requestSubmit(event.submitter ?? undefined)
    }, { once: true })
    d.showModal()
    d.querySelector('button[value=no]').focus()
  })
}
